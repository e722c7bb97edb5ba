//! A small Dockerfile parser: instructions (comments, blank lines and `\` continuations),
//! stages, and the pieces of `RUN`, `COPY` and `LABEL` the checks read.

/// One instruction, its continuation lines joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Instruction {
    /// Line of the instruction's first line (1-based).
    pub(crate) line: usize,
    /// The keyword, upper-cased (`FROM`, `RUN`, …).
    pub(crate) keyword: String,
    /// Everything after the keyword.
    pub(crate) args: String,
}

/// Splits a Dockerfile into instructions: lines whose first non-blank character is `#` are
/// comments (parser directives included) and are dropped, also inside a continuation, as are
/// blank lines; a line ending in `\` continues on the next one.
pub(crate) fn parse(text: &str) -> Result<Vec<Instruction>, String> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if let Some(comment) = trimmed.strip_prefix('#') {
            if comment
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("escape=")
            {
                return Err(format!(
                    "line {}: the escape directive is not supported",
                    i + 1
                ));
            }
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(body) => (body.trim_end(), true),
            None => (trimmed, false),
        };
        let (line, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        if !joined.is_empty() && !body.is_empty() {
            joined.push(' ');
        }
        joined.push_str(body);
        if continues {
            pending = Some((line, joined));
        } else {
            out.push(instruction(line, &joined)?);
        }
    }
    match pending {
        Some((line, _)) => Err(format!(
            "line {line}: a continuation runs past the end of the file"
        )),
        None => Ok(out),
    }
}

pub(crate) fn instruction(line: usize, text: &str) -> Result<Instruction, String> {
    let (keyword, args) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    if keyword.is_empty() || !keyword.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(format!("line {line}: `{keyword}` is not an instruction"));
    }
    Ok(Instruction {
        line,
        keyword: keyword.to_ascii_uppercase(),
        args: args.trim().to_owned(),
    })
}

/// A build stage: its `FROM` and the instructions up to the next one.
#[derive(Clone, Debug)]
pub(crate) struct Stage {
    /// The base: an image reference or an earlier stage's name.
    pub(crate) image: String,
    /// `AS <name>`.
    pub(crate) name: Option<String>,
    pub(crate) line: usize,
    pub(crate) body: Vec<Instruction>,
}

impl Stage {
    /// The stage's instructions with `keyword`, in order.
    pub(crate) fn all<'a>(
        &'a self,
        keyword: &'a str,
    ) -> impl Iterator<Item = &'a Instruction> + 'a {
        self.body.iter().filter(move |i| i.keyword == keyword)
    }

    /// The stage's last instruction with `keyword`.
    pub(crate) fn last(&self, keyword: &str) -> Option<&Instruction> {
        self.body.iter().rev().find(|i| i.keyword == keyword)
    }
}

pub(crate) fn stages(instructions: &[Instruction]) -> Result<Vec<Stage>, String> {
    let mut out: Vec<Stage> = Vec::new();
    for ins in instructions {
        if ins.keyword == "FROM" {
            let mut words = ins.args.split_whitespace().filter(|w| !w.starts_with("--"));
            let image = words
                .next()
                .ok_or_else(|| format!("line {}: FROM names no image", ins.line))?;
            let name = match (words.next(), words.next()) {
                (Some(r#as), Some(name)) if r#as.eq_ignore_ascii_case("as") => {
                    Some(name.to_owned())
                }
                (None, None) => None,
                _ => return Err(format!("line {}: malformed FROM", ins.line)),
            };
            out.push(Stage {
                image: image.to_owned(),
                name,
                line: ins.line,
                body: Vec::new(),
            });
        } else if let Some(stage) = out.last_mut() {
            stage.body.push(ins.clone());
        } else if ins.keyword != "ARG" {
            return Err(format!(
                "line {}: {} before the first FROM",
                ins.line, ins.keyword
            ));
        }
    }
    if out.is_empty() {
        return Err("no FROM".into());
    }
    Ok(out)
}

/// The exec form (`["a", "b"]`) of an `ENTRYPOINT`, `CMD` or `HEALTHCHECK CMD`; `None` for the
/// shell form.
pub(crate) fn exec_form(args: &str) -> Option<Vec<String>> {
    serde_json::from_str(args).ok()
}

/// A `RUN`'s options (`--mount=…`) and its shell commands (split at `&&`, `||` and `;`), each
/// as words.
pub(crate) fn run_commands(args: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut words = args.split_whitespace().peekable();
    let mut options = Vec::new();
    while let Some(w) = words.next_if(|w| w.starts_with("--")) {
        options.push(w.to_owned());
    }
    let rest: Vec<&str> = words.collect();
    let script = rest
        .join(" ")
        .replace("&&", "\n")
        .replace("||", "\n")
        .replace(';', "\n");
    let commands = script
        .lines()
        .map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|c| !c.is_empty())
        .collect();
    (options, commands)
}

/// Targets of a `RUN`'s `--mount=type=cache,target=…` options.
pub(crate) fn cache_mounts(options: &[String]) -> Vec<String> {
    options
        .iter()
        .filter_map(|o| o.strip_prefix("--mount="))
        .filter(|m| m.split(',').any(|kv| kv == "type=cache"))
        .filter_map(|m| {
            m.split(',')
                .find_map(|kv| kv.strip_prefix("target=").or(kv.strip_prefix("dst=")))
                .map(str::to_owned)
        })
        .collect()
}

/// What a `cargo build` command asks for.
#[derive(Debug, Default)]
pub(crate) struct CargoBuild {
    pub(crate) release: bool,
    pub(crate) locked: bool,
    pub(crate) bins: Vec<String>,
    pub(crate) packages: Vec<String>,
}

pub(crate) fn cargo_build(words: &[String]) -> Option<CargoBuild> {
    let mut rest = words.strip_prefix(&["cargo".to_owned()])?;
    if rest.first().is_some_and(|w| w.starts_with('+')) {
        rest = &rest[1..];
    }
    let rest = rest.strip_prefix(&["build".to_owned()])?;
    let mut build = CargoBuild::default();
    let mut it = rest.iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "--release" | "-r" => build.release = true,
            "--locked" | "--frozen" => build.locked = true,
            "--bin" => build.bins.extend(it.next().cloned()),
            "-p" | "--package" => build.packages.extend(it.next().cloned()),
            _ => {
                if let Some(bin) = w.strip_prefix("--bin=") {
                    build.bins.push(bin.to_owned());
                } else if let Some(p) = w.strip_prefix("--package=") {
                    build.packages.push(p.to_owned());
                }
            }
        }
    }
    Some(build)
}

/// `(source, destination)` of an `install` or `cp` command with one source.
pub(crate) fn copy_command(words: &[String]) -> Option<(String, String)> {
    let (command, args) = words.split_first()?;
    if command != "install" && command != "cp" {
        return None;
    }
    let mut operands = Vec::new();
    let mut it = args.iter();
    while let Some(w) = it.next() {
        if command == "install" && matches!(w.as_str(), "-m" | "-o" | "-g") {
            it.next();
        } else if !w.starts_with('-') {
            operands.push(w.clone());
        }
    }
    match operands.as_slice() {
        [src, dst] => Some((src.clone(), dst.clone())),
        _ => None,
    }
}

/// `key=value` pairs of a `LABEL` (values bare or double-quoted).
pub(crate) fn labels(args: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut chars = args.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        if chars.next() != Some('=') {
            return Err(format!("LABEL {key}: not key=value"));
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("LABEL {key}: unterminated quote")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
            }
        }
        out.push((key, value));
    }
}

/// A Rust release, `1.95.0` (`1.89` reads as `1.89.0`).
pub(crate) fn version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    let v = (
        parts.next()??,
        parts.next()??,
        parts.next().unwrap_or(Some(0))?,
    );
    parts.next().is_none().then_some(v)
}

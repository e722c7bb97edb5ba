module tether.local/cluster/pause

go 1.26

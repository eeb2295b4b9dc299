"""Programs the tests run as processes of their own (ranks, children to kill, training runs),
and the small Lightning app several of them and the Lightning tests share."""

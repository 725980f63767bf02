"""Several hosts, one service (docs/fleet.md): what each host publishes, where a request goes, the hop
between hosts, and pins kept somewhere in the fleet."""

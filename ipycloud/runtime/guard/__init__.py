"""Keeping the session alive: the session guard, its settings and status, deadline actions,
activity pings. May import ``machine``, ``checkpoint``, ``storage`` and the shared helpers."""

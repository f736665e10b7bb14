"""The operator's side: alerts and their SQL, dead letters' SQL, a bulk operation's replay
of dead letters and its watch, durations as operators read them. The writers are
``jobs.services``."""

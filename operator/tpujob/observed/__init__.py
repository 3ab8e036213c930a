"""What the operator sees: raw API objects read into frozen views, and what they mean.

Pure: parsing and interpretation only, no I/O. `views` turns pods, nodes and the heartbeat
into values; `nodes` says when a node's trouble is a failure; `training` reads and judges the
trainer's health numbers; `trouble` finds the current attempt's failures and turns them into
the facts the diagnosis reads; `redact` keeps secrets out of what is copied from logs.
"""

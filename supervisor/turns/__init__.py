"""The turns: one agent answering one message, from spawn to its last saved entry.

A per-turn CLI process (:mod:`.process`, which also holds the ports a turn reaches the rest of
corral through), a turn on a persistent ACP agent (:mod:`.acp`), and the pool of those agents,
one per channel and agent (:mod:`.agents`). Internal.
"""

"""The turns: one agent answering one message, from spawn to its last saved entry.

The ports a turn reaches the rest of corral through, and what every kind of turn is
(:mod:`.ports`); the skeleton every turn runs on (:mod:`.base`); a per-turn CLI process
(:mod:`.process`), a turn on a persistent ACP agent (:mod:`.acp`), one such agent process
(:mod:`.agents`) and the pool of them, one per channel and agent (:mod:`.pool`). Internal.
"""

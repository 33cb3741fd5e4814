"""The process machinery: how a turn's processes start, are contained, and end.

Spawning a process tree in its own session and cgroup (:mod:`.tree`, :mod:`.cgroup`), inside
bubblewrap (:mod:`.sandbox`); the registry of every live process group (:mod:`.registry`);
killing a tree and reaping its stragglers (:mod:`.teardown`); reading an agent's output by lines
(:mod:`.lines`); private files and folders (:mod:`.files`); the test hooks that park a spawn at
an exact point (:mod:`.hooks`); and sweeping what a crashed daemon left behind
(:mod:`.recovery`). Internal.
"""

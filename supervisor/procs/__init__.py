"""The process machinery: how a turn's processes start, are contained, and end.

Spawning a process tree in its own session and cgroup (:mod:`.tree`, :mod:`.cgroup`), inside
bubblewrap (:mod:`.sandbox`) with the files its command needs (:mod:`.installation`), under a
seccomp filter (:mod:`.seccomp`) and what else a turn may ask of the kernel (:mod:`.confine`);
the registry of every live process group (:mod:`.registry`); killing a tree and reaping its
stragglers (:mod:`.teardown`); reading an agent's output by lines (:mod:`.lines`) and keeping
its stdin open for steered messages (:mod:`.stdin`); private files and folders
(:mod:`.files`); the memory a new turn could use (:mod:`.memory`); who is on the control
socket's other end (:mod:`.peers`); a hidden file replaced on the host, which ends the turns
it was hidden from (:mod:`.covers`); a network namespace per turn (:mod:`.netns`, made by the
script :mod:`._netns_helper` in a process of its own); the test hooks that park a spawn at an
exact point (:mod:`.hooks`); and ending the processes a crashed daemon left behind
(:mod:`.recovery`). Internal.
"""

"""Configuration: ``corral.toml`` read into frozen values (:mod:`.settings`), the chat platforms
its ``[bridges.NAME]`` tables may name (:mod:`.platforms`: the ``corral.bridges`` entry points)
and the checks run before a daemon starts (:mod:`.preflight`). Internal.
"""

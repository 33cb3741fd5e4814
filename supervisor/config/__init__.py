"""Configuration: ``corral.toml`` read into frozen values (:mod:`.settings`) and the checks
run before a daemon starts (:mod:`.preflight`). Internal.
"""

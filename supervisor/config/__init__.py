"""Configuration: what ``corral.toml`` says as frozen values (:mod:`.model`), read and checked
into them (:mod:`.settings`, which re-exports the model), the chat platforms its
``[bridges.NAME]`` tables may name (:mod:`.platforms`: the ``corral.bridges`` entry points) and
the checks run before a daemon starts (:mod:`.preflight`). Internal.
"""

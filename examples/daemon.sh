#!/bin/sh
# The daemon and its CLI, in a folder holding corral.toml (config.example.toml works as is).
set -e
corral run -c corral.toml &                     # the daemon (in the foreground, normally)
until corral status >/dev/null 2>&1; do sleep 0.1; done   # until its socket answers

corral send general "Hello! Who are you?"       # prints the accepted seq
corral wait general --timeout 60                # until the channel is idle
corral tail general                             # the transcript
corral send general "Please do a long task"
corral stop general                             # returns when the stop is complete
corral status
corral shutdown                                 # an orderly shutdown
wait

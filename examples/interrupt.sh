#!/bin/sh
# A message to a busy agent: queued (the default), interrupting its turn, or steering it.
set -e
corral run -c corral.toml &
until corral status >/dev/null 2>&1; do sleep 0.1; done

corral send general "Please do a long task"          # the demo agent runs a tool for a while
until corral tail general | grep -q "tool running"; do sleep 0.2; done
corral send general "and then this"                  # queued behind it
corral send --interrupt general "Never mind: just say hello"   # stops the task, drops the queue, runs next
corral wait general --timeout 60
corral tail general                                  # ... "Interrupted by a new message. 1 queued message was not run."
corral send --steer general "hello again"            # nothing is running: it runs as a message, and says so
corral wait general --timeout 60
corral shutdown
wait

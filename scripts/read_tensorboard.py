"""Reads the scalars of a TensorBoard log directory with TensorBoard's own event reader and
prints them as JSON: {"files": [names], "scalars": {tag: [[step, wall_time, value], ...]}}.

The check of the event files `metrics.tensorboard = true` writes
(crates/rollflash/tests/it/tensorboard.rs compares the output with metrics.jsonl). Orphaned
data is *not* purged, so a step written twice shows up twice instead of being hidden.

    scripts/setup_tensorboard.sh && .venv-tb/bin/python scripts/read_tensorboard.py RUN_DIR/tensorboard
"""

import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator


def main() -> None:
    logdir = sys.argv[1]
    acc = event_accumulator.EventAccumulator(
        logdir,
        size_guidance={event_accumulator.SCALARS: 0},  # 0: keep every event
        purge_orphaned_data=False,
    )
    acc.Reload()
    scalars = {}
    for tag in acc.Tags()["scalars"]:
        scalars[tag] = [
            [e.step, e.wall_time, e.value if math.isfinite(e.value) else None]
            for e in acc.Scalars(tag)
        ]
    files = sorted(f for f in os.listdir(logdir) if "tfevents" in f)
    json.dump({"files": files, "scalars": scalars}, sys.stdout)


if __name__ == "__main__":
    main()

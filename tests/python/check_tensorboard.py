"""Reads a folder of TensorBoard event files with TensorBoard's own reader
(PyPI tensorboard, EventAccumulator) and prints every scalar as JSON:
{"tag": {"step": value, ...}, ...}."""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator

acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
out = {}
for tag in acc.Tags()["scalars"]:
    out[tag] = {str(e.step): e.value for e in acc.Scalars(tag)}
print(json.dumps(out))

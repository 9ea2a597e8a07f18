"""The node's side (internal): the agent that runs inside an engine task (:mod:`.agent`), the
node process it spawns (:mod:`.child`, ``python -m duotf._node.child``), the output relay, the
reports, TensorBoard, GPU addresses and the doctor's probe."""

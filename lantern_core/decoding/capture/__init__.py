"""What capturing a step needs beneath the step registry (`decoding/step_graphs.py`): recording CUDA graphs by
PyTorch's pool and stream rules (`graph_capture`), fusing a step with Inductor first (`compiled_step`), and the
record of how a run's steps ran (`step_execution`). Nothing here keeps runners or chooses devices."""

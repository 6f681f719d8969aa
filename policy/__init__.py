"""The policy's contract, shared by the learner (torch) and the edge (onnxruntime): the screen codec, the
vocabulary, pruning, decoding under the action grammar, the `.vla` bundle and its runtime."""

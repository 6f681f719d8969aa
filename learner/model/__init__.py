"""The VLA itself: the network (vla), its LoRA adapters, checkpoints, the recipe-free export to the edge's bundle
(export), the torch eager reference (infer), and the fp32 ceiling a learner figure is compared with.
"""

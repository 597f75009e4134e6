"""The model: the transformer, its layers and experts, and its layout-independent init."""

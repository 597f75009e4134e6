"""Where tokens come from and the batches cut from them."""

"""A stand-in for Colab's ``google.colab`` package, which only exists inside Colab."""

"""mla_var3 inside other libraries' models.

- :mod:`mla_var3.integrations.transformers` — ``enable(model)`` / ``disable(model)``: a Hugging
  Face transformers model's MLA attention (DeepSeek-V2/V3 and any model with the same MLA
  weights) run by :class:`~mla_var3.model.MLALayer` over a latent cache kept in a transformers
  ``Cache`` (needs the ``hf`` extra: ``pip install 'mla_var3[hf]'``).

Nothing here is imported by ``import mla_var3``: each integration imports its library itself.
"""

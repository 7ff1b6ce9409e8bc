"""Interop with transformers: import its encoder-decoders exactly, and export them back.

:func:`from_transformers` (also ``Seq2Seq.from_transformers``) and :func:`to_transformers` (also
``Seq2Seq.to_transformers``); the families and how they map onto :class:`hybrid.ModelConfig` are in
:mod:`hybrid.hf.families`. transformers is imported only when one of them runs.
"""

from hybrid.hf.families import FAMILIES, SUPPORTED
from hybrid.hf.importer import TOKENIZER_FOLDER, from_transformers

__all__ = ["FAMILIES", "SUPPORTED", "TOKENIZER_FOLDER", "from_transformers"]

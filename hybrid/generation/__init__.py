"""Generation: greedy, sampling and beam search over any decoding state, with transformers' option names."""

from hybrid.generation.config import GenerationConfig
from hybrid.generation.engine import GenerateOutput, generate
from hybrid.generation.processors import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from hybrid.generation.rules import DecodingRules
from hybrid.generation.stopping import EosTokenCriteria, StoppingCriteriaList
from hybrid.generation.streamers import BaseStreamer, TokenIteratorStreamer, TokenStreamer

__all__ = [
    "generate", "GenerationConfig", "GenerateOutput", "DecodingRules",
    "LogitsProcessorList", "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
    "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor", "NoBadWordsLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor", "SuppressTokensLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "StoppingCriteriaList", "EosTokenCriteria",
    "BaseStreamer", "TokenStreamer", "TokenIteratorStreamer",
]

from __future__ import annotations

from lucebox.engine.registry import parse_help_capabilities, parse_model_archs

HELP = """
-ctk,  --cache-type-k TYPE              KV cache data type for K
                                        allowed values: f32, f16, bf16, q8_0, q4_0
                                        (default: f16)
--spec-type none,draft-simple,draft-mtp,draft-dflash,ngram-cache
                                        comma-separated list of types
"""

ARCH_CPP = """
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_GEMMA3,           "gemma3"           },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};
"""


def test_help_capabilities():
    spec, kv = parse_help_capabilities(HELP)
    assert spec == ("draft-simple", "draft-mtp", "draft-dflash", "ngram-cache")
    assert kv == ("f32", "f16", "bf16", "q8_0", "q4_0")


def test_model_archs_from_source_table():
    assert parse_model_archs(ARCH_CPP) == ("llama", "gemma3")
    assert parse_model_archs("nothing here") == ()

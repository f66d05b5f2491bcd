"""The config.json files of published decoders, as the Hugging Face hub serves them, and
one way to scale them down in sizes only: shared by the LLM tests."""

import copy

# meta-llama/Llama-3.1-8B
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

# meta-llama/Llama-3.2-1B: an explicit head_dim, tied embeddings
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

# Qwen/Qwen2.5-7B: q, k and v biases; a sliding window that is off
QWEN2_5_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

# mistralai/Mistral-7B-v0.1: a sliding window of 4,096 (wider than the tests' context)
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}

# openai-community/gpt2
GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}

PUBLISHED = {"Llama-3.1-8B": LLAMA_3_1_8B, "Llama-3.2-1B": LLAMA_3_2_1B, "Qwen2.5-7B": QWEN2_5_7B,
             "Mistral-7B-v0.1": MISTRAL_7B, "gpt2": GPT2}

# (query heads, head dim, vocabulary) of each scaled model: the kv heads keep the
# published ratio to the query heads, the MLP its ratio to the hidden size.
SCALED = {"Llama-3.1-8B": (8, 16, 448), "Llama-3.2-1B": (8, 16, 384), "Qwen2.5-7B": (7, 16, 512),
          "Mistral-7B-v0.1": (8, 16, 320), "gpt2": (4, 16, 331)}


def scaled(config: dict, heads: int, head_dim: int, vocab: int, layers: int = 2) -> dict:
    """``config`` scaled down in sizes only: ``heads`` query heads of ``head_dim`` (the
    hidden size their product), the kv heads in the published ratio, the MLP in its
    ratio to the hidden size, ``layers`` layers and a ``vocab`` of tokens. Every other
    field stays as published; the token ids keep their distance from the vocabulary's
    end (a published id would lie past the small vocabulary). Position limits stay: they
    size nothing the steps build (GPT-2's table of n_positions rows excepted, small)."""
    out = copy.deepcopy(config)
    old_vocab = out["vocab_size"]
    if out["model_type"] == "gpt2":
        out.update(n_head=heads, n_embd=heads * head_dim, n_layer=layers)
    else:
        h0, heads0 = out["hidden_size"], out["num_attention_heads"]
        kv0 = out.get("num_key_value_heads", heads0)
        assert heads * kv0 % heads0 == 0, "the GQA ratio must survive the scaling"
        hidden = heads * head_dim
        out.update(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                   intermediate_size=2 * round(out["intermediate_size"] * hidden / h0 / 2))
        if "num_key_value_heads" in out:
            out["num_key_value_heads"] = heads * kv0 // heads0
        if "head_dim" in out:
            out["head_dim"] = head_dim
    out["vocab_size"] = vocab
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        ids = out.get(key)
        if isinstance(ids, int) and ids >= vocab:
            out[key] = max(0, vocab - (old_vocab - ids))
        elif isinstance(ids, list):
            out[key] = [i if i < vocab else max(0, vocab - (old_vocab - i)) for i in ids]
    return out

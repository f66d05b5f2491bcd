"""BERT and GPT-2 stacks from ``transformers`` configs (random weights, no download), for
tests and benchmarks."""

import torch
import transformers


def bert(hidden, layers, heads, vocab=1000, positions=128):
    cfg = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=positions)
    return transformers.BertModel(cfg, add_pooling_layer=False)


def gpt2(hidden, layers, heads, vocab=1000, positions=128):
    cfg = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab,
                                  n_positions=positions, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(cfg)


class LastHiddenState(torch.nn.Module):
    """The encoder / decoder stack from token ids to its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state

"""Tiny ``transformers`` architectures for ``benchmarks/wide_sweep.py``, built from configs.

Each entry names a model class of ``transformers`` and the config arguments that make
it tiny (hidden size 32, two layers, four heads, a vocabulary of 100, 32x32 images):
random weights, nothing downloaded. The model is wrapped as ``tests/hf/architectures.py``
wraps its own (``Wrapper``: ``forward`` takes one tensor and returns the first output);
for encoder-decoder models only the encoder is taken. Decoders are built with
``use_cache=False``, as an export of a single forward pass is.

An architecture that this ``transformers`` lacks, or whose config is refused, fails in
:func:`build` and is counted by the sweep by reason, never an error of the sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

HIDDEN, LAYERS, HEADS, VOCAB = 32, 2, 4, 100
#: Token ids stay clear of 0-2, the padding, start and end ids of most vocabularies.
TOKENS = (1, 8)

_BERT = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
             num_attention_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=64)
_DECODER = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB,
                max_position_embeddings=64, use_cache=False)
_GQA = {**_DECODER, "num_key_value_heads": 2}
_VIT = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, image_size=32, patch_size=8)
_BART = dict(d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
             encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
             encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN, vocab_size=VOCAB,
             max_position_embeddings=64, use_cache=False)
_T5 = dict(d_model=HIDDEN, d_ff=2 * HIDDEN, num_layers=LAYERS, num_heads=HEADS, d_kv=8,
           vocab_size=VOCAB)
_AUDIO = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, conv_dim=(16, 16), conv_stride=(5, 2),
              conv_kernel=(10, 3), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=4, mask_time_prob=0.0)


def tokens(generator: np.random.Generator) -> np.ndarray:
    """``[1, 8]`` token ids in 3..99."""
    return generator.integers(3, VOCAB, TOKENS).astype(np.int64)


def image(generator: np.random.Generator) -> np.ndarray:
    """A ``[1, 3, 32, 32]`` image."""
    return generator.standard_normal((1, 3, 32, 32)).astype(np.float32)


def audio(generator: np.random.Generator) -> np.ndarray:
    """``[1, 800]`` samples of a waveform."""
    return generator.standard_normal((1, 800)).astype(np.float32)


def mel(generator: np.random.Generator) -> np.ndarray:
    """``[1, 16, 32]`` log-mel features (Whisper's encoder, 16 bins, 32 frames)."""
    return generator.standard_normal((1, 16, 32)).astype(np.float32)


def frames(generator: np.random.Generator) -> np.ndarray:
    """``[1, 32, 16]`` filter-bank frames (Speech2Text's encoder: time, then features)."""
    return generator.standard_normal((1, 32, 16)).astype(np.float32)


_ARGUMENT = {tokens: "input_ids", image: "pixel_values", audio: "input_values",
             mel: "input_features", frames: "input_features"}


@dataclass(frozen=True)
class HFModel:
    """One architecture: its ``transformers`` model class, config arguments and input."""

    name: str
    model_class: str
    config: dict = field(repr=False)
    make_input: Callable[[np.random.Generator], np.ndarray] = tokens
    encoder_only: bool = False
    """Take the model's encoder (encoder-decoder models: BART, Whisper, ...)."""

    def build(self):
        """The model, random weights, in eval mode, wrapped to one tensor in and out."""
        import torch
        import transformers
        from hf.architectures import Wrapper

        model_class = getattr(transformers, self.model_class)
        torch.manual_seed(0)
        model = model_class(model_class.config_class(**self.config))
        if self.encoder_only:
            model = model.get_encoder()
        return Wrapper(model, _ARGUMENT[self.make_input]).eval()


def _models() -> list[HFModel]:
    """Every architecture the sweep tries, encoders, vision, decoders, seq2seq, audio.

    Long because it is a table: one line per architecture.
    """
    m = HFModel
    return [
        # -- text encoders
        m("bert", "BertModel", _BERT),
        m("roberta", "RobertaModel", _BERT),
        m("distilbert", "DistilBertModel", dict(dim=HIDDEN, hidden_dim=2 * HIDDEN,
                                                n_layers=LAYERS, n_heads=HEADS,
                                                vocab_size=VOCAB, max_position_embeddings=64)),
        m("albert", "AlbertModel", {**_BERT, "embedding_size": 16}),
        m("electra", "ElectraModel", {**_BERT, "embedding_size": 16}),
        m("deberta", "DebertaModel", {**_BERT, "relative_attention": True,
                                      "max_relative_positions": 16,
                                      "pos_att_type": ["c2p", "p2c"]}),
        m("deberta-v2", "DebertaV2Model", {**_BERT, "relative_attention": True,
                                           "position_buckets": 8, "norm_rel_ebd": "layer_norm",
                                           "share_att_key": True,
                                           "pos_att_type": ["p2c", "c2p"]}),
        m("squeezebert", "SqueezeBertModel", {**_BERT, "embedding_size": HIDDEN}),
        m("mpnet", "MPNetModel", _BERT),
        m("xlm-roberta", "XLMRobertaModel", _BERT),
        m("convbert", "ConvBertModel", {**_BERT, "embedding_size": HIDDEN}),
        m("funnel", "FunnelBaseModel", dict(d_model=HIDDEN, n_head=HEADS, d_head=8,
                                            d_inner=2 * HIDDEN, block_sizes=[1, 1],
                                            vocab_size=VOCAB)),
        m("camembert", "CamembertModel", _BERT),
        m("megatron-bert", "MegatronBertModel", _BERT),
        m("rembert", "RemBertModel", {**_BERT, "input_embedding_size": 16,
                                      "output_embedding_size": 16}),
        m("roformer", "RoFormerModel", {**_BERT, "embedding_size": HIDDEN}),
        m("mobilebert", "MobileBertModel", {**_BERT, "embedding_size": 16,
                                            "intra_bottleneck_size": 16,
                                            "true_hidden_size": 16,
                                            "num_feedforward_networks": 2}),
        m("ernie", "ErnieModel", _BERT),
        m("nystromformer", "NystromformerModel", {**_BERT, "num_landmarks": 4,
                                                  "segment_means_seq_len": 8}),
        m("layoutlm", "LayoutLMModel", _BERT),
        m("big-bird", "BigBirdModel", {**_BERT, "attention_type": "original_full"}),
        m("esm", "EsmModel", {**_BERT, "pad_token_id": 1, "mask_token_id": 2,
                              "position_embedding_type": "rotary"}),
        m("data2vec-text", "Data2VecTextModel", _BERT),
        m("xlm", "XLMModel", dict(emb_dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                  vocab_size=VOCAB, max_position_embeddings=64)),
        m("splinter", "SplinterModel", _BERT),
        m("luke", "LukeModel", {**_BERT, "entity_vocab_size": 10, "entity_emb_size": 16}),
        m("flaubert", "FlaubertModel", dict(emb_dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                            vocab_size=VOCAB, max_position_embeddings=64)),
        m("ibert", "IBertModel", _BERT),
        m("xlnet", "XLNetModel", dict(d_model=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                      d_inner=2 * HIDDEN, vocab_size=VOCAB, use_mems_eval=False)),
        m("longformer", "LongformerModel", {**_BERT, "attention_window": 4}),
        m("fnet", "FNetModel", _BERT),
        m("roc-bert", "RoCBertModel", {**_BERT, "pronunciation_vocab_size": 10,
                                       "shape_vocab_size": 10}),
        m("yoso", "YosoModel", _BERT),
        m("mra", "MraModel", {**_BERT, "block_per_row": 2, "max_position_embeddings": 64}),
        m("modernbert", "ModernBertModel", {**_BERT, "global_attn_every_n_layers": 2,
                                            "local_attention": 4, "pad_token_id": 0}),
        m("nomic-bert", "NomicBertModel", _BERT),
        # -- vision; where the default initialisation (std 0.02) leaves a stack of
        # convolutions with outputs under 1e-5 (MobileNets, EfficientNet, MobileViT,
        # LeViT) or blocks scaled by 1e-5 (PoolFormer, SwiftFormer), a larger one keeps
        # the output of order 1 so that a plant can change it beyond the tolerance (and
        # no larger: at 0.35-0.4, MobileNetV2's export leaves parity and MobileViT's
        # intermediates lose precision)
        m("vit", "ViTModel", _VIT, image),
        m("deit", "DeiTModel", _VIT, image),
        m("beit", "BeitModel", {**_VIT, "use_relative_position_bias": True}, image),
        m("data2vec-vision", "Data2VecVisionModel", {**_VIT, "use_relative_position_bias": True},
          image),
        m("yolos", "YolosModel", {**_VIT, "image_size": [32, 32], "num_detection_tokens": 4},
          image),
        m("dinov2", "Dinov2Model", {**_VIT, "image_size": 32}, image),
        m("vit-msn", "ViTMSNModel", _VIT, image),
        m("swin", "SwinModel", dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                    num_heads=[2, 2], window_size=4), image),
        m("swinv2", "Swinv2Model", dict(image_size=32, patch_size=4, embed_dim=16,
                                        depths=[1, 1], num_heads=[2, 2], window_size=4),
          image),
        m("convnext", "ConvNextModel", dict(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
          image),
        m("convnextv2", "ConvNextV2Model", dict(num_stages=2, hidden_sizes=[16, 32],
                                                depths=[1, 1]), image),
        m("resnet", "ResNetModel", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                        layer_type="basic"), image),
        m("regnet", "RegNetModel", dict(embedding_size=16, hidden_sizes=[16, 32],
                                        depths=[1, 1], groups_width=8), image),
        m("mobilenet-v1", "MobileNetV1Model", dict(image_size=32, depth_multiplier=0.25,
                                                    initializer_range=0.3), image),
        m("mobilenet-v2", "MobileNetV2Model", dict(image_size=32, depth_multiplier=0.25,
                                                    initializer_range=0.3), image),
        m("efficientnet", "EfficientNetModel", dict(image_size=32, width_coefficient=0.25,
                                                    depth_coefficient=0.25, hidden_dim=320,
                                                    initializer_range=0.62),
          image),
        m("segformer", "SegformerModel", dict(num_encoder_blocks=2, depths=[1, 1],
                                              sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                              num_attention_heads=[1, 2], patch_sizes=[7, 3],
                                              strides=[4, 2], mlp_ratios=[2, 2]), image),
        m("poolformer", "PoolFormerModel", dict(num_encoder_blocks=2, depths=[1, 1],
                                                hidden_sizes=[16, 32], patch_sizes=[7, 3],
                                                strides=[4, 2], padding=[2, 1], mlp_ratio=2.0,
                                                layer_scale_init_value=1.0),
          image),
        m("levit", "LevitModel", dict(image_size=32, hidden_sizes=[16, 32, 48],
                                      num_attention_heads=[1, 2, 3], depths=[1, 1, 1],
                                      key_dim=[8, 8, 8], mlp_ratio=[2, 2, 2],
                                      attention_ratio=[2, 2, 2], initializer_range=0.2), image),
        m("bit", "BitModel", dict(embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1],
                                  layer_type="bottleneck", global_padding="SAME",
                                  num_groups=8), image),
        m("cvt", "CvtModel", dict(embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3],
                                  mlp_ratio=[2.0, 2.0, 2.0], drop_path_rate=[0.0, 0.0, 0.0]),
          image),
        m("pvt-v2", "PvtV2Model", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                       hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                       patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
          image),
        m("focalnet", "FocalNetModel", dict(image_size=32, patch_size=4, embed_dim=16,
                                            depths=[1, 1], focal_levels=[2, 2],
                                            focal_windows=[3, 3]), image),
        m("mobilevit", "MobileViTModel", dict(image_size=32, hidden_sizes=[32, 48, 64],
                                              neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                              num_attention_heads=2, initializer_range=0.3), image),
        m("dinov2-registers", "Dinov2WithRegistersModel", {**_VIT, "num_register_tokens": 2},
          image),
        m("swiftformer", "SwiftFormerModel", dict(depths=[1, 1, 1, 1],
                                                  embed_dims=[16, 16, 32, 32],
                                                  layer_scale_init_value=1.0), image),
        m("pvt", "PvtModel", dict(image_size=32, num_encoder_blocks=2, depths=[1, 1],
                                  sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32],
                                  num_attention_heads=[1, 2], patch_sizes=[4, 2],
                                  strides=[4, 2], mlp_ratios=[2, 2]), image),
        m("glpn", "GLPNModel", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                    hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                    patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
          image),
        m("vitdet", "VitDetModel", {**_VIT, "pretrain_image_size": 32}, image),
        # -- decoders, one forward pass
        m("gpt2", "GPT2Model", dict(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS,
                                    vocab_size=VOCAB, n_positions=64, use_cache=False)),
        m("gpt-neo", "GPTNeoModel", dict(num_layers=LAYERS, hidden_size=HIDDEN,
                                         num_heads=HEADS, vocab_size=VOCAB,
                                         max_position_embeddings=64, window_size=4,
                                         attention_types=[[["global", "local"], 1]],
                                         use_cache=False)),
        m("gpt-neox", "GPTNeoXModel", _DECODER),
        m("opt", "OPTModel", dict(hidden_size=HIDDEN, ffn_dim=2 * HIDDEN,
                                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                  vocab_size=VOCAB, max_position_embeddings=64,
                                  word_embed_proj_dim=HIDDEN, use_cache=False)),
        m("llama", "LlamaModel", _GQA),
        m("mistral", "MistralModel", _GQA),
        m("qwen2", "Qwen2Model", _GQA),
        m("qwen3", "Qwen3Model", {**_DECODER, "head_dim": 8}),
        m("phi", "PhiModel", _DECODER),
        m("phi3", "Phi3Model", {**_DECODER, "pad_token_id": 0}),
        m("gemma", "GemmaModel", {**_DECODER, "head_dim": 8}),
        m("gemma2", "Gemma2Model", {**_DECODER, "head_dim": 8}),
        m("falcon", "FalconModel", dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                        num_attention_heads=HEADS, vocab_size=VOCAB,
                                        use_cache=False)),
        m("bloom", "BloomModel", dict(hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                      vocab_size=VOCAB, use_cache=False)),
        m("gptj", "GPTJModel", dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, rotary_dim=4,
                                    vocab_size=VOCAB, n_positions=64, use_cache=False)),
        m("codegen", "CodeGenModel", dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                          rotary_dim=4, vocab_size=VOCAB, n_positions=64,
                                          n_ctx=64, use_cache=False)),
        m("mpt", "MptModel", dict(d_model=HIDDEN, n_heads=HEADS, n_layers=LAYERS,
                                  expansion_ratio=2, max_seq_len=64, vocab_size=VOCAB,
                                  use_cache=False)),
        m("stablelm", "StableLmModel", _DECODER),
        m("olmo", "OlmoModel", _DECODER),
        m("olmo2", "Olmo2Model", _DECODER),
        m("starcoder2", "Starcoder2Model", _DECODER),
        m("persimmon", "PersimmonModel", _DECODER),
        m("biogpt", "BioGptModel", {**_BERT, "use_cache": False}),
        m("xglm", "XGLMModel", dict(d_model=HIDDEN, ffn_dim=2 * HIDDEN, num_layers=LAYERS,
                                    attention_heads=HEADS, vocab_size=VOCAB,
                                    max_position_embeddings=64, use_cache=False)),
        m("cohere", "CohereModel", _DECODER),
        m("granite", "GraniteModel", _DECODER),
        m("gpt-bigcode", "GPTBigCodeModel", dict(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS,
                                                 vocab_size=VOCAB, n_positions=64,
                                                 use_cache=False)),
        m("mixtral", "MixtralModel", {**_DECODER, "num_local_experts": 4,
                                      "num_experts_per_tok": 2}),
        m("helium", "HeliumModel", {**_DECODER, "head_dim": 8}),
        m("openai-gpt", "OpenAIGPTModel", dict(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS,
                                               vocab_size=VOCAB, n_positions=64)),
        m("ctrl", "CTRLModel", dict(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, dff=2 * HIDDEN,
                                    vocab_size=VOCAB, n_positions=64, use_cache=False)),
        m("gpt-neox-japanese", "GPTNeoXJapaneseModel",
          {**_DECODER, "intermediate_multiple_size": 2}),
        m("qwen2-moe", "Qwen2MoeModel", {**_DECODER, "num_experts": 4, "num_experts_per_tok": 2,
                                         "moe_intermediate_size": 16,
                                         "shared_expert_intermediate_size": 32}),
        m("olmoe", "OlmoeModel", {**_DECODER, "num_experts": 4, "num_experts_per_tok": 2}),
        m("granitemoe", "GraniteMoeModel", {**_DECODER, "num_local_experts": 4,
                                            "num_experts_per_tok": 2}),
        m("recurrent-gemma", "RecurrentGemmaModel", dict(
            hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=1, vocab_size=VOCAB, lru_width=HIDDEN,
            attention_window_size=8, block_types=["recurrent", "attention"], use_cache=False)),
        m("mamba", "MambaModel", dict(hidden_size=HIDDEN, state_size=8, num_hidden_layers=LAYERS,
                                      vocab_size=VOCAB, use_cache=False)),
        m("rwkv", "RwkvModel", dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                    vocab_size=VOCAB, context_length=64, use_cache=False)),
        m("gemma3-text", "Gemma3TextModel", {**_DECODER, "head_dim": 8, "sliding_window": 4}),
        m("glm", "GlmModel", {**_DECODER, "head_dim": 8, "pad_token_id": 0}),
        m("smollm3", "SmolLM3Model", {**_DECODER, "pad_token_id": 0}),
        m("nemotron", "NemotronModel", {**_DECODER, "head_dim": 8}),
        m("exaone4", "Exaone4Model", _DECODER),
        m("arcee", "ArceeModel", _DECODER),
        # -- encoders of encoder-decoder models
        m("t5-encoder", "T5EncoderModel", _T5),
        m("mt5-encoder", "MT5EncoderModel", _T5),
        m("umt5-encoder", "UMT5EncoderModel", _T5),
        m("bart-encoder", "BartModel", _BART, encoder_only=True),
        m("marian-encoder", "MarianModel", {**_BART, "decoder_vocab_size": VOCAB,
                                            "pad_token_id": VOCAB - 1}, encoder_only=True),
        m("pegasus-encoder", "PegasusModel", _BART, encoder_only=True),
        m("m2m100-encoder", "M2M100Model", _BART, encoder_only=True),
        m("whisper-encoder", "WhisperModel", {**_BART, "num_mel_bins": 16,
                                              "max_source_positions": 16,
                                              "max_target_positions": 64, "pad_token_id": 0},
          mel, encoder_only=True),
        m("blenderbot-encoder", "BlenderbotModel", _BART, encoder_only=True),
        m("mbart-encoder", "MBartModel", _BART, encoder_only=True),
        m("plbart-encoder", "PLBartModel", _BART, encoder_only=True),
        m("mvp-encoder", "MvpModel", _BART, encoder_only=True),
        m("led-encoder", "LEDModel", {**{k: v for k, v in _BART.items()
                                         if k != "max_position_embeddings"},
                                      "max_encoder_position_embeddings": 64,
                                      "max_decoder_position_embeddings": 64,
                                      "attention_window": 4}, encoder_only=True),
        m("bigbird-pegasus-encoder", "BigBirdPegasusModel",
          {**_BART, "attention_type": "original_full"}, encoder_only=True),
        m("speech2text-encoder", "Speech2TextModel", {**_BART, "input_feat_per_channel": 16,
                                                      "max_source_positions": 64,
                                                      "conv_channels": 16},
          frames, encoder_only=True),
        # -- speech
        m("wav2vec2", "Wav2Vec2Model", _AUDIO, audio),
        m("hubert", "HubertModel", _AUDIO, audio),
        m("wavlm", "WavLMModel", {**_AUDIO, "num_buckets": 16, "max_bucket_distance": 32},
          audio),
        m("sew", "SEWModel", {**_AUDIO, "squeeze_factor": 2}, audio),
        m("unispeech", "UniSpeechModel", _AUDIO, audio),
        m("unispeech-sat", "UniSpeechSatModel", _AUDIO, audio),
        m("wav2vec2-conformer", "Wav2Vec2ConformerModel",
          {**_AUDIO, "conv_depthwise_kernel_size": 3}, audio),
        m("data2vec-audio", "Data2VecAudioModel", {**_AUDIO, "conv_pos_kernel_size": 5,
                                                   "num_conv_pos_embeddings": 5}, audio),
    ]


HF_MODELS: dict[str, HFModel] = {model.name: model for model in _models()}

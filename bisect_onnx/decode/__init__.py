"""Decode loops: a decoder with a key/value cache, compared step by step.

A causal LM generates one token per forward, feeding back its cache. Here a prompt
(step 0, the prefill, with an empty cache) and N greedy decode steps run in PyTorch and
in ONNX Runtime twice over: free-running (each side its own cache and tokens) and
teacher-forced (the runtime fed PyTorch's cache and token at each step). The first
failing step is named with its kind: introduced at that step (bisected like any
forward) or accumulated through the cache (named at the layer whose cache first leaves
tolerance).

Modules: :mod:`.layout` (the flat names of the cache), :mod:`.flat_cache` (a
Hugging Face decoder as a module of tensors), :mod:`.export` (its export),
:mod:`.file_graph` (the file's names and shapes, its weights unread), :mod:`.steps`
(the step loop), :mod:`.step_report` and :mod:`.text` (the report),
:mod:`.run` (:func:`bisect_decode`). ``bisect_onnx`` imports the options, the report
and :func:`bisect_decode` itself; torch, ONNX Runtime and ``transformers`` are imported
only when a decode runs.
"""

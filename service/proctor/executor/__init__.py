"""The executor room: whatever runs the model, behind one protocol (protocol.py: ``Feed``, ``Capabilities``,
``Executor``).

The engine (``proctor.engine``) keeps the scheduler, the step and every request's state, and hands an executor
the step's feeds; an executor owns the rest — the weights in their mode (weights.py, slot_weights.py,
gguf_linear.py), the C++ kernels (fused_decode.py, kernels/), the families' arithmetic (families.py,
slot_ops.py), and the KV cache as slots (slot_cache.py). ``SlotForward`` (slot_forward.py, its strategies in
strategies.py, triton_step.py and graph_step.py) and ``PerSlotExecutor`` (model_runner.py) implement it; which one
serves, with which strategies, is the executor plan's to say (plan.py), once, and ``make_executor`` builds it.
It sits a layer below the engine (tests/unit/test_import_graph.py): nothing here imports the engine.
"""

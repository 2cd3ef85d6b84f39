"""Telemetry's clocks: what times a sampled call, chosen per call by where its kernels run and what they write.

    CPU tensors ..................................... host    perf_counter around the call      (timing)
    GPU, the call's kernels write stamps ............ device  %globaltimer span + kernel frame   (stamps, frame)
    GPU, no stamps, eager, stream gate built ........ gated   event pair behind the gate - const (gate, events)
    GPU, no stamps, eager, no gate (or not yet) ..... events  plain event pair, host gaps in it  (events)
    GPU, no stamps, captured into a CUDA graph ...... graph   captured external pair, per replay (events, graphs)

Measured against CUPTI in docs/timing-fidelity.md; ``timing`` holds the sink every clock feeds.
"""

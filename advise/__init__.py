"""What a gate change would cost or save on observed traffic: latency tables x traffic x routing policies.

Pure modules: ``tables`` (load and check latency tables), ``interp`` (interpolation in log(rows)
with a band), ``latency`` (one model over several tables), ``traffic`` (the observed calls),
``policies`` (candidate policies, routed by ``dispatcher.policy.decide``), ``scan`` (cost of
traffic under each candidate, with its band) and ``report`` (the JSON and its headline). The
side effects (HTTP, files, Prometheus, the service) live in ``sources``, ``cli`` and ``service``.
"""

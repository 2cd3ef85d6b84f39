"""Multiprocess mode (TP ranks, as vLLM runs them): each process writes its own files, a scrape merges them all.

::

    process A (rank 0)          process B (rank 1)            dead process C
    writer.MultiprocWriter      writer.MultiprocWriter
      | pwrite at flush           | pwrite at flush
      v                           v
    counter_routescope-<A>.db   counter_routescope-<B>.db     counter_routescope-<C>.db
    histogram_routescope-<A>.db histogram_routescope-<B>.db   histogram_routescope-<C>.db
    gauge_livemax_routescope-<A>.db  ...                        |  compact.compact (flock,
                                                                 v  manifest, then delete)
                                                   *_routescope-archive.db
      \\________________________ one directory ___________________/
                 |                                    |
    reader.RoutescopeMultiProcessCollector     prometheus_client's MultiProcessCollector
    (routescope's /metrics; merge.py turns     (vLLM's /metrics: reads the same *.db)
     its families into Totals for /routing)

``mpfile``: the file format (prometheus_client's: ``used`` header, then length-prefixed JSON keys
each followed by value and timestamp doubles), read with bounded plain reads, never mmap.
``directory``: file names, process ids, the directory lock and quarantine (a bad file is renamed
aside, counted and listed). ``health``: what went wrong, for /readyz and /routing.
"""

"""What the recorder knows about the engine that serves its sessions, and how it knows it.

``certify.py`` checks, with probe conversations the engine renders, whether its chat template keeps
chains exact; ``engine_watch.py`` holds that certificate with the engine's version, served models
and template fingerprint, and says when to look again; ``provenance.py`` is what each record says of
the engine and the sampling that produced it (template, logprobs mode, decoding constraint). The
package imports nothing here."""

"""Records: the typed, self-digesting evidence every stage writes.

``types`` declares the record, manifest and statistics shapes; ``store`` writes, reads,
validates and seals records and manifests; ``packs`` seals many small files into one
indexed pack; ``vouch`` is what a job vouches for when it writes a manifest. Above the
plan (records name arms), below media, the fleet and every stage."""

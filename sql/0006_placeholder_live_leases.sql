-- outboxd migration 0006: a placeholder on the `wake` branch only, so that
-- 0007 builds (the embedder refuses gaps). The live-leases branch brings the
-- real 0006; at the merge this file is dropped in favour of it.
INSERT INTO :"schema".schema_migrations (version, name) VALUES (6, 'placeholder_live_leases')
    ON CONFLICT (version) DO NOTHING;

-- The functions on every message's path (migrations 0023, 0024, 0025) are planned once per
-- session: PL/pgSQL (a LANGUAGE sql function that is not inlined is parsed and
-- planned at each call) with plan_cache_mode = force_generic_plan (left to
-- choose, the plan cache made a custom plan for each call's arrays). Their
-- plans do not depend on the arrays; the plans themselves are checked by
-- tests/python/integration/test_sql_claim_plan.py and test_sql_advance_many.py.
-- The API still behaves as before: claim.sql, advance_many.sql and the others.
BEGIN;
SELECT plan(17);

CREATE FUNCTION pg_temp.config_of(f regprocedure) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(proconfig, '{}') FROM pg_proc WHERE oid = f $$;
CREATE FUNCTION pg_temp.language_of(f regprocedure) RETURNS name LANGUAGE sql AS $$
    SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = f $$;

SELECT ok(pg_temp.config_of(f) @> ARRAY['plan_cache_mode=force_generic_plan',
                                       'search_path=pepsi, pg_catalog, pg_temp'],
          f::text || ' is planned generically, search_path still pinned')
  FROM unnest(ARRAY['pepsi.claim(bigint, text[], integer[], boolean, bigint[])',
                    'pepsi.check_answered(bigint, bigint[])',
                    'pepsi.get_messages(bigint[])',
                    'pepsi.finish_many(bigint[], text, bigint)',
                    'pepsi.advance_many(bigint[], text, text, bigint)']::regprocedure[]) AS f;

-- And from migration 0024: index scans and nested loops whatever the
-- statistics of the session's first call said (an empty table, at start).
SELECT ok(pg_temp.config_of(f) @> ARRAY['enable_seqscan=off', 'enable_hashjoin=off',
                                       'enable_mergejoin=off'],
          f::text || ' keeps index plans as the table grows')
  FROM unnest(ARRAY['pepsi.claim(bigint, text[], integer[], boolean, bigint[])',
                    'pepsi.check_answered(bigint, bigint[])',
                    'pepsi.get_messages(bigint[])',
                    'pepsi.finish_many(bigint[], text, bigint)',
                    'pepsi.advance_many(bigint[], text, text, bigint)']::regprocedure[]) AS f;

-- And from migration 0025: the claim's pick cannot be a primary key walk with a
-- sort either, and the disabled sort its final ORDER BY keeps is not compiled.
SELECT ok(pg_temp.config_of('pepsi.claim(bigint, text[], integer[], boolean, bigint[])')
              @> ARRAY['enable_sort=off', 'jit=off'],
          'claim sets enable_sort and jit off');

SELECT is(pg_temp.language_of(f), 'plpgsql'::name, f::text || ' is PL/pgSQL (its plan is cached)')
  FROM unnest(ARRAY['pepsi.finish_many(bigint[], text, bigint)',
                    'pepsi.advance_many(bigint[], text, text, bigint)']::regprocedure[]) AS f;

-- Behaviour kept: a batch finishes and advances through the generic plans,
-- and advance_many still checks to_stage before looking at rows.
SELECT count(*) AS queued FROM pepsi.enqueue_many('gp', ARRAY['{}', '{}', '{}']::jsonb[]) \gset
SELECT array_agg(workqueue_id ORDER BY workqueue_id) AS ids
  FROM pepsi.claim(5, ARRAY['gp'], ARRAY[3]) \gset
SELECT is((SELECT count(*) FROM pepsi.get_messages(:'ids'::bigint[])), 3::bigint,
          'get_messages reads the claimed rows');
SELECT is((SELECT count(*) FROM pepsi.advance_many((:'ids'::bigint[])[1:1], 'gp', 'gq', 5)),
          1::bigint, 'advance_many moves its row');
SELECT is((SELECT count(*) FROM pepsi.finish_many((:'ids'::bigint[])[2:3], 'gp', 5)), 2::bigint,
          'finish_many finishes its rows');
SELECT throws_ok($$SELECT pepsi.advance_many('{}', 'gp', 'no such stage!', 5)$$, '22023', NULL,
                 'advance_many checks to_stage first, as before');

SELECT * FROM finish();
ROLLBACK;

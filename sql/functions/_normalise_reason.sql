-- pepsi._normalise_reason(reason text) → text
--   The group a failure reason belongs to: the same reason with the parts
--   that differ from message to message masked, so "bad input n=201" and
--   "bad input n=202" are one group ("bad input n=<n>").  In order:
--     * the protocol's answer code at the start ("1 RuntimeError: x" ->
--       "RuntimeError: x");
--     * uuids -> <uuid>;
--     * hex: 0x… and runs of 6+ hex digits holding a digit and a letter -> <hex>;
--     * numbers starting a word (123, -4, 1.5, 201ms -> <n>ms); digits
--       inside a word (utf8, http2) stay;
--     * runs of white space -> one space, trimmed.
--   NULL in, NULL out.  IMMUTABLE: usable in GROUP BY and in an expression
--   index.
--   Callers: granted to nobody (dashboard_snapshot, failed_reasons,
--   failed_messages and list_messages' reason_group call it: one rule for
--   the command line and the dashboard).
CREATE OR REPLACE FUNCTION pepsi._normalise_reason(reason text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pepsi, pg_catalog, pg_temp
AS $$
    SELECT btrim(regexp_replace(
             regexp_replace(
               regexp_replace(
                 regexp_replace(
                   regexp_replace(
                     regexp_replace(reason, '^\s*-?[0-9]+\s+', ''),
                     '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
                   '\m0x[0-9a-f]+\M', '<hex>', 'gi'),
                 '\m(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{6,}\M', '<hex>', 'gi'),
               '(^|[^0-9A-Za-z_])-?[0-9]+(\.[0-9]+)?', '\1<n>', 'g'),
             '\s+', ' ', 'g'))
$$;

// A Node stage (node-postgres) for the pooler test: the worker protocol with the
// documented SQL through a pooler in transaction mode. Each id: one transaction that
// records the run in public.pool_ran and advances the row to argv[2] (or finishes it).
// A message whose payload has "flaky": "<this stage>" is answered "1 ..." while its
// retries are 0 (an automatic retry then succeeds).
'use strict';
const { Client } = require('pg');
const readline = require('readline');

const stage = process.env.PEPSI_STAGE;
const did = process.env.PEPSI_DISPATCHER_ID;
const next = process.argv[2] && process.argv[2] !== 'worker' && process.argv[2] !== '-c'
  ? process.argv[2] : null;

async function one(client, id) {
  // Unnamed statements only: a named one (the `name` option) lives in one server
  // session, which a transaction pooler does not keep for this client.
  const got = await client.query(
    'SELECT retries, payload FROM pepsi.get_messages(ARRAY[$1]::bigint[])', [id]);
  if (got.rows.length !== 1) return `1 no running row ${id}`;
  const { retries, payload } = got.rows[0];
  if (payload.flaky === stage && retries === 0) return '1 flaky: fails on its first run';
  await client.query('BEGIN');
  try {
    await client.query(
      'INSERT INTO public.pool_ran (id, stage, retries, worker_pid, backend_pid)'
      + ' VALUES ($1, $2, $3, $4, pg_backend_pid())', [id, stage, retries, process.pid]);
    const moved = next
      ? await client.query('SELECT pepsi.advance($1, $2, $3, $4) AS ok', [id, stage, next, did])
      : await client.query('SELECT pepsi.finish($1, $2, $3) AS ok', [id, stage, did]);
    if (!moved.rows[0].ok) {
      await client.query('ROLLBACK');
      return '1 transition did not apply';
    }
    await client.query('COMMIT');
    return '0';
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    return `1 ${String(err.message).replace(/\s+/g, ' ')}`;
  }
}

async function main() {
  const client = new Client({ connectionString: process.env.PEPSI_DSN });
  await client.connect();
  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  for await (const line of lines) {
    const answer = await one(client, line.split('\t')[0]);
    process.stdout.write(answer + '\n');
  }
  await client.end();
}

main().catch((err) => { console.error(err); process.exit(75); });

// Runs the lab extension's unit tests (test/*.test.ts) under node's own test runner:
// each file is bundled by esbuild for node, then `node --test` runs the bundles.
import { build } from 'esbuild';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const files = (await readdir(HERE)).filter(name => name.endsWith('.test.ts'));
const out = await mkdtemp(join(tmpdir(), 'ipycloud-labextension-tests-'));
try {
  await build({
    absWorkingDir: HERE,
    entryPoints: files,
    bundle: true,
    platform: 'node',
    format: 'esm',
    outdir: out,
    outExtension: { '.js': '.mjs' },
    logLevel: 'warning'
  });
  const bundles = files.map(name => join(out, name.replace(/\.ts$/, '.mjs')));
  const result = spawnSync(process.execPath, ['--test', ...bundles], { stdio: 'inherit' });
  process.exitCode = result.status ?? 1;
} finally {
  await rm(out, { recursive: true, force: true });
}

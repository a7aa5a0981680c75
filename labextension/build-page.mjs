// Builds the dashboard page a kernel serves itself (ipycloud/runtime/monitor/webpage.py):
// src/page/ bundled by esbuild, its script and style put inline into src/page/index.html,
// written as one file into the Python package. `--production` minifies.
import { build } from 'esbuild';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const OUTPUT = join(HERE, '..', 'ipycloud', 'monitor_page', 'index.html');
const minify = process.argv.includes('--production');

/** The bundle of `entry` as text; it must not hold the tag that would close it early. */
async function bundle(entry, closingTag) {
  const result = await build({
    absWorkingDir: HERE,
    entryPoints: [entry],
    bundle: true,
    minify,
    write: false,
    target: 'es2020',
    legalComments: 'none',
    logLevel: 'warning'
  });
  const text = result.outputFiles[0].text;
  if (text.toLowerCase().includes(closingTag)) {
    throw new Error(`${entry}: its bundle holds "${closingTag}", which would end it early`);
  }
  return text;
}

const [script, style, template] = await Promise.all([
  bundle('src/page/main.ts', '</script'),
  bundle('src/page/page.css', '</style'),
  readFile(join(HERE, 'src', 'page', 'index.html'), 'utf8')
]);
await mkdir(dirname(OUTPUT), { recursive: true });
await writeFile(
  OUTPUT,
  template.replace('/* style */', () => style).replace('/* script */', () => script)
);

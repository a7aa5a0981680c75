import assert from 'node:assert/strict';
import { test } from 'node:test';

import { formatCores, formatOf, formatUsage, share } from '../src/format';

test('cores are counted in the right number', () => {
  assert.equal(formatCores(1), '1 core');
  assert.equal(formatCores(2), '2 cores');
  assert.equal(formatCores(1.5), '1.5 cores');
  assert.equal(formatCores(null), 'the CPUs');
});

test('a GPU memory figure NVML does not give reads n/a, its share none', () => {
  assert.equal(share(null, 1024), null);
  assert.equal(share(512, null), null);
  assert.equal(share(256, 1024), 25);
  assert.equal(formatUsage(null, 16 * 1024 ** 3), 'n/a of 16.0 GiB');
  assert.equal(formatUsage(null, null), 'n/a of n/a');
  assert.equal(formatOf(1024 ** 3, null), '1.0 GiB of n/a');
});

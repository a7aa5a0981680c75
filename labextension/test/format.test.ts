import assert from 'node:assert/strict';
import { test } from 'node:test';

import { formatCores } from '../src/format';

test('cores are counted in the right number', () => {
  assert.equal(formatCores(1), '1 core');
  assert.equal(formatCores(2), '2 cores');
  assert.equal(formatCores(1.5), '1.5 cores');
});

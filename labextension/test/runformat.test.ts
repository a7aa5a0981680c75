import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { IRunSummary } from '../src/api';
import {
  etaVerdict,
  formatBest,
  formatFigure,
  formatProgress,
  progressPercent,
  runHost
} from '../src/runformat';

const RUN = {
  id: 'a1b2c3d4e5f6',
  status: 'running',
  step: 120,
  total_steps: 1000,
  epoch: 1,
  epochs: 10
} as IRunSummary;

test('a run that would end after the session is said not to finish', () => {
  assert.deepEqual(etaVerdict(2 * 3600 + 600, 3600 + 2400), {
    text: 'ETA 2 h 10 min — session ends in 1 h 40 min: will not finish',
    late: true
  });
});

test('a run that ends before the session is not late', () => {
  assert.deepEqual(etaVerdict(300, 3600), {
    text: 'ETA 5 min — session ends in 1 h 00 min',
    late: false
  });
});

test('without a session end only the ETA shows, and without an ETA nothing', () => {
  assert.deepEqual(etaVerdict(40, null), { text: 'ETA 40 s', late: false });
  assert.equal(etaVerdict(null, 3600), null);
});

test('progress counts steps of the total and epochs from 1', () => {
  assert.equal(formatProgress(RUN), 'step 120/1000 · epoch 2/10');
  assert.equal(progressPercent(RUN), 12);
  const open = { ...RUN, total_steps: null, epochs: null };
  assert.equal(formatProgress(open), 'step 120');
  assert.equal(progressPercent(open), null);
});

test('figures keep four significant digits', () => {
  assert.equal(formatFigure(0.532149), '0.5321');
  assert.equal(formatFigure(0.00003), '3.00e-5');
  const best = { metric: 'val_loss', value: 0.40012, epoch: 0 };
  assert.equal(formatBest(best), 'best val_loss 0.4001 (epoch 1)');
  assert.equal(formatBest(null), '');
  assert.equal(formatBest({ ...best, epoch: null }), 'best val_loss 0.4001');
});

test('a run on another machine than the server says which', () => {
  assert.equal(runHost({ ...RUN, host: 'node-2', remote: true }), 'on node-2');
  assert.equal(runHost({ ...RUN, host: 'this-machine', remote: false }), '');
  assert.equal(runHost({ ...RUN, host: null, remote: true }), '');
});

/**
 * The kernels table: which notebook each kernel runs, its RAM, CPU and GPU memory, and a
 * button that shuts it down.
 */
import { stopIcon } from '@jupyterlab/ui-components';

import { IKernel, IKernels } from './api';
import { element, setAttribute, setChildren, setText } from './dom';
import { formatBytes, formatPercent } from './format';

export class KernelsTable {
  readonly node: HTMLElement;

  /** @param shutDown - called with a kernel when its shut-down button is pressed */
  constructor(private readonly _shutDown: (kernel: IKernel) => void) {
    this._body = element('tbody');
    this._note = element('div', { class: 'ipycloud-Card-note' });
    this.node = element(
      'div',
      { class: 'ipycloud-Kernels' },
      element(
        'table',
        { class: 'ipycloud-Kernels-table', 'data-ipycloud-kernels': '' },
        this._body
      ),
      this._note
    );
  }

  /** Show a new answer; rows of kernels still running are kept, so a click is not lost. */
  update(answer: IKernels): void {
    const rows = new Map<string, KernelRow>();
    for (const kernel of answer.kernels) {
      const row = this._rows.get(kernel.id) ?? new KernelRow(this._shutDown);
      row.update(kernel);
      rows.set(kernel.id, row);
    }
    setChildren(this._body, [...rows.values()].map(row => row.node));
    this._rows = rows;
    setText(
      this._note,
      !answer.kernels.length
        ? 'No kernel is running.'
        : answer.gpu_problem
          ? `GPU memory per kernel: ${answer.gpu_problem}`
          : ''
    );
  }

  private _body: HTMLElement;
  private _note: HTMLElement;
  private _rows = new Map<string, KernelRow>();
}

/** One kernel's row; its cells are updated in place. */
class KernelRow {
  readonly node: HTMLTableRowElement;

  constructor(shutDown: (kernel: IKernel) => void) {
    const figure = (column: string) => element('span', { 'data-ipycloud-column': column });
    this._cells = {
      label: element('div', { class: 'ipycloud-Kernels-path', 'data-ipycloud-column': 'name' }),
      state: figure('state'),
      ram: figure('ram'),
      cpu: figure('cpu'),
      gpuMemory: figure('gpu-memory'),
      problem: element('div', { class: 'ipycloud-Card-note' })
    };
    this._button = element('button', {
      class: 'jp-Button jp-mod-minimal ipycloud-Kernels-shutDown',
      'data-ipycloud-action': 'shut-down'
    });
    this._button.append(stopIcon.element({ tag: 'span' }));
    this._button.addEventListener('click', () => {
      if (this._kernel) {
        shutDown(this._kernel);
      }
    });
    const { label, state, ram, cpu, gpuMemory, problem } = this._cells;
    this._name = element(
      'td',
      {},
      label,
      element('div', { class: 'ipycloud-Kernels-figures' }, state, ram, cpu, gpuMemory),
      problem
    );
    this.node = element('tr', {}, this._name, element('td', {}, this._button));
  }

  update(kernel: IKernel): void {
    this._kernel = kernel;
    const cells = this._cells;
    const name = kernelName(kernel);
    setAttribute(this.node, 'data-ipycloud-kernel-id', kernel.id);
    setAttribute(this.node, 'data-ipycloud-kernel-path', kernel.path ?? '');
    setAttribute(this._name, 'title', kernelTitle(kernel));
    setText(cells.label, name);
    setText(cells.state, kernel.execution_state ?? 'unknown');
    setText(cells.ram, `RAM ${formatBytes(kernel.rss)}`);
    setText(cells.cpu, `CPU ${formatPercent(kernel.cpu_percent)}`);
    setText(cells.gpuMemory, `GPU ${gpuMemory(kernel)}`);
    setText(cells.problem, kernel.problem ?? '');
    setAttribute(this._button, 'title', `Shut down the kernel of ${name}`);
    setAttribute(this._button, 'aria-label', `Shut down the kernel of ${name}`);
  }

  private _kernel: IKernel | null = null;
  private _button: HTMLButtonElement;
  private _name: HTMLElement;
  private _cells: Record<
    'label' | 'state' | 'ram' | 'cpu' | 'gpuMemory' | 'problem',
    HTMLElement
  >;
}

/** The notebook's or console's path, else the kernel's name. */
export function kernelName(kernel: IKernel): string {
  return kernel.path ?? `${kernel.name ?? 'kernel'} ${kernel.id.slice(0, 8)}`;
}

function kernelTitle(kernel: IKernel): string {
  const what = [kernel.type, kernel.name].filter(Boolean).join(' ') || 'kernel';
  const pid = kernel.pid === null ? 'no local process' : `PID ${kernel.pid}`;
  const processes =
    kernel.processes === null
      ? ''
      : `, ${kernel.processes} ${kernel.processes === 1 ? 'process' : 'processes'}`;
  return `${what}, ${pid}${processes}`;
}

/** `0: 3.1 GiB, 1: 512 MiB` (per GPU index), `–` when the kernel holds no GPU memory. */
function gpuMemory(kernel: IKernel): string {
  if (!kernel.gpu_memory.length) {
    return '–';
  }
  return kernel.gpu_memory.map(entry => `${entry.gpu}: ${formatBytes(entry.used)}`).join(', ');
}

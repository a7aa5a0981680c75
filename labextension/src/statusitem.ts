/**
 * The compact view of the latest reading: per GPU utilisation and memory, RAM against the
 * container's limit, CPU. It sits in JupyterLab's status bar, or in Notebook 7's top bar.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IGpuReading, IReading } from './api';
import { element, setAttribute } from './dom';
import { formatCores, formatOf, formatPercent, formatUsage, level, Level, share } from './format';
import { Connection, ResourceMonitor } from './monitor';
import { IOptions } from './settings';

/** From this many GPUs on, each GPU is drawn as two small bars instead of words. */
const COMPACT_FROM = 3;

export class StatusItem extends Widget {
  /**
   * @param monitor - where the readings come from
   * @param options - the current settings
   * @param open - what a click does (open the panel)
   */
  constructor(
    private readonly _monitor: ResourceMonitor,
    private _options: IOptions,
    open: () => void
  ) {
    super({ node: element('div', { role: 'button', tabindex: '0' }) });
    this.addClass('ipycloud-StatusItem');
    this.node.dataset.ipycloudStatus = 'loading';
    this.node.addEventListener('click', open);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        open();
      }
    });
    _monitor.changed.connect(() => this.update(), this);
    this.update();
  }

  set options(options: IOptions) {
    this._options = options;
    this.update();
  }

  protected override onUpdateRequest(msg: Message): void {
    super.onUpdateRequest(msg);
    const { connection, latest } = this._monitor;
    this.node.dataset.ipycloudStatus = connection.state;
    if (connection.state === 'ok' && latest) {
      this._render(latest);
    } else {
      this._renderConnection(connection);
    }
  }

  private _render(reading: IReading): void {
    const parts = new Set(this._options.statusBar);
    const children: HTMLElement[] = [];
    const gpuParts = parts.has('gpu-utilization') || parts.has('gpu-memory');
    if (gpuParts && reading.gpus.length >= COMPACT_FROM) {
      children.push(element('span', { class: 'ipycloud-StatusItem-label' }, 'GPU'));
      children.push(...reading.gpus.map(gpu => this._compactGpu(gpu, parts)));
    } else if (gpuParts) {
      children.push(...reading.gpus.map(gpu => this._gpu(gpu, parts)));
    }
    if (parts.has('ram')) {
      const ram = reading.ram;
      const percent = share(ram.used, ram.limit);
      children.push(
        this._part(
          'ram',
          `RAM ${formatUsage(ram.used, ram.limit)}`,
          level(percent, this._options.ramWarningPercent)
        )
      );
    }
    if (parts.has('cpu')) {
      children.push(this._part('cpu', `CPU ${formatPercent(reading.cpu.percent)}`, 'ok'));
    }
    if (!children.length) {
      children.push(element('span', { class: 'ipycloud-StatusItem-label' }, 'ipycloud'));
    }
    this._replace(children);
    setAttribute(this.node, 'title', tooltip(reading));
  }

  private _gpu(gpu: IGpuReading, parts: Set<string>): HTMLElement {
    const words = [`GPU${gpu.index}`];
    // NVML gives no utilisation while MIG is on: the memory says more then.
    if (parts.has('gpu-utilization') && gpu.utilization_percent !== null) {
      words.push(formatPercent(gpu.utilization_percent));
    }
    if (parts.has('gpu-memory')) {
      words.push(formatUsage(gpu.memory_used, gpu.memory_total));
    }
    const node = this._part('gpu', words.join(' '), this._gpuLevel(gpu));
    node.dataset.ipycloudGpu = String(gpu.index);
    return node;
  }

  private _compactGpu(gpu: IGpuReading, parts: Set<string>): HTMLElement {
    const node = this._part('gpu', '', this._gpuLevel(gpu));
    node.classList.add('ipycloud-mod-compact');
    node.dataset.ipycloudGpu = String(gpu.index);
    const bar = (kind: string, percent: number | null) => {
      const fill = element('span', { class: `ipycloud-StatusItem-bar ipycloud-mod-${kind}` });
      fill.style.height = `${Math.max(0, Math.min(100, percent ?? 0))}%`;
      return element('span', { class: 'ipycloud-StatusItem-barFrame' }, fill);
    };
    if (parts.has('gpu-utilization')) {
      node.append(bar('utilization', gpu.utilization_percent));
    }
    if (parts.has('gpu-memory')) {
      node.append(bar('memory', share(gpu.memory_used, gpu.memory_total)));
    }
    return node;
  }

  private _gpuLevel(gpu: IGpuReading): Level {
    return level(share(gpu.memory_used, gpu.memory_total), this._options.gpuMemoryWarningPercent);
  }

  private _part(kind: string, text: string, state: Level): HTMLElement {
    return element(
      'span',
      {
        class: `ipycloud-StatusItem-part ipycloud-mod-${state}`,
        'data-ipycloud-part': kind,
        'data-ipycloud-level': state
      },
      text
    );
  }

  private _renderConnection(connection: Connection): void {
    const [text, title] = {
      loading: ['ipycloud …', 'ipycloud: asking the server for its resources'],
      ok: ['ipycloud …', 'ipycloud: waiting for the first reading'],
      missing: [
        'ipycloud: off',
        "ipycloud's server extension is not enabled on this Jupyter server"
      ],
      error: [
        'ipycloud: offline',
        `ipycloud: ${connection.state === 'error' ? connection.message : ''}`
      ]
    }[connection.state];
    this._replace([element('span', { class: 'ipycloud-StatusItem-label' }, text)]);
    setAttribute(this.node, 'title', title);
  }

  /** Replace the content, unless it would look the same. */
  private _replace(children: HTMLElement[]): void {
    const html = children.map(child => child.outerHTML).join('');
    if (html !== this._html) {
      this._html = html;
      this.node.replaceChildren(...children);
    }
  }

  private _html = '';
}

/** Every figure of the status bar in full, one line each, for the tooltip. */
function tooltip(reading: IReading): string {
  const lines = reading.gpus.map(
    gpu =>
      `GPU ${gpu.index} (${gpu.name}): ${formatPercent(gpu.utilization_percent)} busy, ` +
      formatOf(gpu.memory_used, gpu.memory_total)
  );
  if (reading.gpu_problem) {
    lines.push(`GPU: ${reading.gpu_problem}`);
  }
  const ram = reading.ram;
  lines.push(
    `RAM: ${formatOf(ram.used, ram.limit)} ` +
      (ram.limited ? "(the container's limit)" : "(the machine's RAM)")
  );
  lines.push(`CPU: ${formatPercent(reading.cpu.percent)} of ${formatCores(reading.cpu.cores)}`);
  lines.push('Click for the ipycloud panel');
  return lines.join('\n');
}

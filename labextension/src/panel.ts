/**
 * The side panel: platform and session time, a card per GPU, CPU, RAM and disks with the
 * hour's sparklines, the kernels table and the latest kernel deaths.
 */
import { lineFormIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IEvent, IKernel, IReading } from './api';
import { element, setText } from './dom';
import { diskFolders, diskShare, formatDuration, formatOf } from './format';
import { GpuCard } from './gpucard';
import { KernelsTable } from './kernels';
import { MachineRows } from './machine';
import { ResourceMonitor } from './monitor';
import { RunsSection } from './runs';
import { IOptions } from './settings';

export const PANEL_ID = 'ipycloud-panel';

export class ResourcePanel extends Widget {
  /**
   * @param monitor - where the figures come from
   * @param options - the current settings
   * @param shutDown - asks about and shuts down a kernel
   * @param _runs - the runs of fit, followed while the panel is shown
   * @param openMachineChart - opens the machine's chart view
   */
  constructor(
    private readonly _monitor: ResourceMonitor,
    private _options: IOptions,
    shutDown: (kernel: IKernel) => void,
    private readonly _runs: RunsSection,
    openMachineChart: () => void
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('ipycloud-Panel');
    this.title.caption = 'ipycloud: GPU, CPU, RAM and kernels';
    this._kernels = new KernelsTable(shutDown);
    const charts = element(
      'button',
      {
        class: 'jp-Button jp-mod-styled ipycloud-Panel-charts',
        'data-ipycloud-action': 'open-machine-chart'
      },
      lineFormIcon.element({ tag: 'span' }),
      'Charts'
    );
    charts.addEventListener('click', openMachineChart);
    this.node.append(
      element('h2', { class: 'ipycloud-Panel-title' }, 'Resources'),
      this._platform,
      this._message,
      this._section('GPUs', 'gpus', this._gpuProblem, this._gpus),
      this._section('Runs', 'runs', _runs.node),
      this._section('CPU and RAM', 'machine', ...this._machine.nodes, charts),
      this._section('Disks', 'disks', this._disks),
      this._section('Kernels', 'kernels', this._kernels.node),
      this._section('Kernel deaths', 'events', this._events)
    );
    _monitor.changed.connect(() => this._updateIfVisible(), this);
    _monitor.kernelsChanged.connect((_, kernels) => this._kernels.update(kernels), this);
  }

  set options(options: IOptions) {
    this._options = options;
    this._updateIfVisible();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._monitor.watch('kernels', 'panel', true);
    this._monitor.watch('events', 'panel', true);
    this._runs.watch(true);
    this.update();
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._monitor.watch('kernels', 'panel', false);
    this._monitor.watch('events', 'panel', false);
    this._runs.watch(false);
  }

  protected override onUpdateRequest(msg: Message): void {
    super.onUpdateRequest(msg);
    const monitor = this._monitor;
    this._renderConnection();
    const latest = monitor.latest;
    if (latest) {
      this._renderPlatform(latest);
      this._renderGpus(monitor.samples);
      this._renderMachine(monitor.samples, latest);
      this._renderDisks(latest);
    }
    if (monitor.kernels) {
      this._kernels.update(monitor.kernels);
    }
    this._renderEvents(monitor.events);
  }

  private _updateIfVisible(): void {
    if (this.isVisible) {
      this.update();
    }
  }

  private _section(title: string, name: string, ...children: Node[]): HTMLElement {
    return element(
      'section',
      { class: 'ipycloud-Panel-section', 'data-ipycloud-section': name },
      element('h3', {}, title),
      ...children
    );
  }

  private _renderConnection(): void {
    const connection = this._monitor.connection;
    this.node.dataset.ipycloudStatus = connection.state;
    if (connection.state === 'missing') {
      const retry = element('button', { class: 'jp-Button jp-mod-styled jp-mod-accept' }, 'Retry');
      retry.addEventListener('click', () => this._monitor.retry());
      this._message.replaceChildren(
        element(
          'p',
          {},
          "ipycloud's server extension is not enabled on this Jupyter server, so there " +
            'is nothing to show. Install ipycloud where the server runs ' +
            '(pip install ipycloud), check that `jupyter server extension list` shows ' +
            'ipycloud.server enabled, and restart the server.'
        ),
        retry
      );
    } else if (connection.state === 'error') {
      this._message.replaceChildren(
        element('p', {}, `No new figures: ${connection.message}. Trying again…`)
      );
    } else if (connection.state === 'loading' && !this._monitor.latest) {
      this._message.replaceChildren(element('p', {}, 'Asking the server…'));
    } else {
      this._message.replaceChildren();
    }
  }

  private _renderPlatform(reading: IReading): void {
    const left = reading.platform.session_left_s;
    setText(
      this._platform,
      reading.platform.name +
        (left === null ? '' : ` · the session ends in ${formatDuration(left)}`)
    );
  }

  private _renderGpus(samples: readonly IReading[]): void {
    const latest = samples[samples.length - 1];
    const indices = latest.gpus.map(gpu => gpu.index);
    if (indices.join() !== this._gpuCards.map(card => card.index).join()) {
      this._gpuCards = indices.map(index => new GpuCard(index));
      this._gpus.replaceChildren(...this._gpuCards.map(card => card.node));
    }
    for (const card of this._gpuCards) {
      card.update(samples, this._options.gpuMemoryWarningPercent);
    }
    setText(
      this._gpuProblem,
      latest.gpu_problem ?? (indices.length ? '' : 'No GPU on this server.')
    );
  }

  private _renderMachine(samples: readonly IReading[], latest: IReading): void {
    this._machine.render(samples, latest, this._options.ramWarningPercent);
  }

  private _renderDisks(reading: IReading): void {
    const key = JSON.stringify(reading.disks);
    if (key === this._disksShown) {
      return;
    }
    this._disksShown = key;
    this._disks.replaceChildren(
      ...reading.disks.map(disk => {
        const bar = element('span', { class: 'ipycloud-Meter-fill' });
        bar.style.width = `${Math.min(100, diskShare(disk) ?? 0)}%`;
        return element(
          'div',
          { class: 'ipycloud-Disk', 'data-ipycloud-disk': disk.name, title: diskFolders(disk) },
          element('span', { class: 'ipycloud-Metric-label' }, disk.name),
          element(
            'span',
            { class: 'ipycloud-Metric-value' },
            formatOf(disk.available, disk.total, 'free of')
          ),
          element('span', { class: 'ipycloud-Meter' }, bar)
        );
      })
    );
  }

  private _renderEvents(events: readonly IEvent[]): void {
    const key = events.map(event => event.id).join();
    if (key === this._eventsShown) {
      return;
    }
    this._eventsShown = key;
    this._events.replaceChildren(
      ...(events.length
        ? events.map(event =>
            element(
              'li',
              { 'data-ipycloud-event-id': String(event.id) },
              element(
                'time',
                { datetime: new Date(event.time * 1000).toISOString() },
                new Date(event.time * 1000).toLocaleTimeString()
              ),
              ` ${event.message}`
            )
          )
        : [element('li', { class: 'ipycloud-Card-note' }, 'None since the server started.')])
    );
  }

  private _platform = element('div', { class: 'ipycloud-Panel-platform' });
  private _message = element('div', { class: 'ipycloud-Panel-message' });
  private _gpuProblem = element('div', { class: 'ipycloud-Card-note' });
  private _gpus = element('div', { class: 'ipycloud-Panel-gpus' });
  private _gpuCards: GpuCard[] = [];
  private _machine = new MachineRows();
  private _disks = element('div', { class: 'ipycloud-Panel-disks' });
  private _disksShown: string | null = null;
  private _kernels: KernelsTable;
  private _events = element('ul', { class: 'ipycloud-Panel-events' });
  private _eventsShown: string | null = null;
}

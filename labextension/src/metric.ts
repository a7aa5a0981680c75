/**
 * One figure of the panel: its name, its value in words, and its sparkline.
 */
import { element, setAttribute, setText } from './dom';
import { Level } from './format';
import { Sparkline } from './sparkline';

export class MetricRow {
  readonly node: HTMLElement;

  /**
   * @param label - what a person reads, e.g. `Memory`
   * @param name - the stable name, as `data-ipycloud-metric`, e.g. `memory`
   */
  constructor(label: string, name: string) {
    this._value = element('span', { class: 'ipycloud-Metric-value' });
    this._sparkline = new Sparkline(name);
    this.node = element(
      'div',
      { class: 'ipycloud-Metric', 'data-ipycloud-metric': name },
      element('span', { class: 'ipycloud-Metric-label' }, label),
      this._value,
      this._sparkline.node
    );
  }

  /**
   * @param text - the latest value in words
   * @param values - the history, oldest first, for the sparkline
   * @param max - the sparkline's top
   * @param state - how the latest value stands against its threshold
   */
  update(text: string, values: readonly (number | null)[], max: number, state: Level = 'ok'): void {
    setText(this._value, text);
    setAttribute(this.node, 'data-ipycloud-level', state);
    this._sparkline.update(values, max);
  }

  private _value: HTMLElement;
  private _sparkline: Sparkline;
}

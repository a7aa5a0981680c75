/**
 * A sparkline: one series drawn as a plain SVG polyline over a fixed scale.
 */
import { setAttribute, svgElement } from './dom';

/** Points drawn at most: longer series are reduced to the maximum of each stretch. */
const MAX_POINTS = 120;

const WIDTH = 120;
const HEIGHT = 24;

export class Sparkline {
  /** The `<svg>` element, for the caller to place. */
  readonly node: SVGSVGElement;

  /** @param name - what the line shows, as `data-ipycloud-sparkline` (e.g. `utilization`) */
  constructor(name: string) {
    this.node = svgElement('svg', {
      class: 'ipycloud-Sparkline',
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      preserveAspectRatio: 'none',
      'data-ipycloud-sparkline': name,
      'aria-hidden': 'true'
    });
    this._line = svgElement('polyline', { class: 'ipycloud-Sparkline-line' });
    this.node.append(this._line);
  }

  /**
   * Draw `values` (oldest first; `null` for a missing figure) from 0 at the bottom to
   * `max` at the top.
   */
  update(values: readonly (number | null)[], max: number): void {
    const points = reduce(values, MAX_POINTS);
    const step = points.length > 1 ? WIDTH / (points.length - 1) : 0;
    const scale = max > 0 ? HEIGHT / max : 0;
    const coordinates: string[] = [];
    points.forEach((value, i) => {
      if (value !== null) {
        const y = HEIGHT - Math.min(HEIGHT, Math.max(0, value * scale));
        coordinates.push(`${(i * step).toFixed(1)},${y.toFixed(1)}`);
      }
    });
    setAttribute(this._line, 'points', coordinates.join(' '));
    this.node.dataset.ipycloudPoints = String(coordinates.length);
  }

  private _line: SVGPolylineElement;
}

/** At most `count` values: the maximum of each stretch, so short peaks stay visible. */
function reduce(values: readonly (number | null)[], count: number): (number | null)[] {
  if (values.length <= count) {
    return [...values];
  }
  const stretch = values.length / count;
  const reduced: (number | null)[] = [];
  for (let i = 0; i < count; i++) {
    let peak: number | null = null;
    const end = Math.floor((i + 1) * stretch);
    for (let j = Math.floor(i * stretch); j < end; j++) {
      const value = values[j];
      if (value !== null && (peak === null || value > peak)) {
        peak = value;
      }
    }
    reduced.push(peak);
  }
  return reduced;
}

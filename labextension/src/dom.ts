/**
 * A few lines of DOM building, so the widgets can be plain Lumino widgets.
 */

type Attributes = Record<string, string>;

/**
 * A new element: `element('td', { class: 'x', 'data-ipycloud-kernel-id': id }, 'text')`.
 */
export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Attributes = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

const SVG = 'http://www.w3.org/2000/svg';

/** A new SVG element with its attributes. */
export function svgElement<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attributes: Attributes = {}
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  return node;
}

/** Set a node's text only when it changed (no layout work for an unchanged figure). */
export function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

/** Make `nodes` the children of `parent`, in order, touching the DOM only when they differ
 * (rows updated in place keep their focus and an ongoing click). */
export function setChildren(parent: Element, nodes: readonly Element[]): void {
  const shown = parent.children;
  if (nodes.length !== shown.length || nodes.some((node, i) => node !== shown[i])) {
    parent.replaceChildren(...nodes);
  }
}

/** Set an attribute only when it changed. */
export function setAttribute(node: Element, name: string, value: string): void {
  if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

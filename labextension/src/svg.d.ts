// The build's loader hands an imported .svg file over as its text.
declare module '*.svg' {
  const text: string;
  export default text;
}

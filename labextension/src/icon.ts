/**
 * ipycloud's icon (bars on a baseline), coloured by the theme.
 */
import { LabIcon } from '@jupyterlab/ui-components';

import gaugeSvg from '../style/gauge.svg';

export const gaugeIcon = new LabIcon({ name: 'ipycloud:gauge', svgstr: gaugeSvg });

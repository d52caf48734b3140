/**
 * Numbers the server sends, formatted only when they are numbers: a status or a result may
 * lack a field or hold null there (`lastMetrics` before the first request, for example).
 */

/** True for a finite number. */
export function isNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/** `value` with `digits` decimals; undefined when it is not a number. */
export function fixed(value: unknown, digits: number): string | undefined {
  return isNumber(value) ? value.toFixed(digits) : undefined;
}

/** `value` as it is, or `?` when it is not a number. */
export function count(value: unknown): string {
  return isNumber(value) ? String(value) : '?';
}

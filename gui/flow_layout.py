"""A layout that places its items left to right and wraps onto a new row where the width
runs out, so a row of buttons never squeezes a label into "Se" or "Sto" in a narrow window."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QSizePolicy, QWidget


class FlowLayout(QLayout):
    def __init__(self, parent: QWidget | None = None, spacing: int = 6):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._stretch_after: set[int] = set()  # indices after which a row pushes right
        self.setSpacing(spacing)
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 - Qt override
        self._items.append(item)

    def add_stretch(self) -> None:
        """Items added after this sit at the right end of their row (when they share it)."""
        self._stretch_after.add(len(self._items))

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 - Qt override
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 - Qt override
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 - Qt override
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        return self._place(QRect(0, 0, width, 0), apply=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 - Qt override
        super().setGeometry(rect)
        self._place(rect, apply=True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        visible = [i for i in self._items if not i.isEmpty()]
        w = sum(i.sizeHint().width() for i in visible) + self.spacing() * max(0, len(visible) - 1)
        h = max((i.sizeHint().height() for i in visible), default=0)
        m = self.contentsMargins()
        return QSize(w + m.left() + m.right(), h + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802 - Qt override
        size = QSize()
        for item in self._items:
            if not item.isEmpty():
                size = size.expandedTo(item.sizeHint())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _place(self, rect: QRect, apply: bool) -> int:
        """Lay the visible items out in rows within ``rect``; returns the height used."""
        m = self.contentsMargins()
        area = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        rows: list[list[tuple[int, QLayoutItem]]] = [[]]
        x = 0
        for i, item in enumerate(self._items):
            if item.isEmpty():
                continue
            w = item.sizeHint().width()
            if rows[-1] and x + w > area.width():
                rows.append([])
                x = 0
            rows[-1].append((i, item))
            x += w + self.spacing()
        y = area.y()
        for row in rows:
            if not row:
                continue
            h = max(item.sizeHint().height() for _i, item in row)
            if apply:
                used = sum(item.sizeHint().width() for _i, item in row) \
                    + self.spacing() * (len(row) - 1)
                split = next((k for k, (i, _item) in enumerate(row)
                              if any(s <= i for s in self._stretch_after) and k > 0
                              and not any(s <= row[k - 1][0] for s in self._stretch_after)),
                             None)
                x = area.x()
                for k, (_i, item) in enumerate(row):
                    if k == split:
                        x += max(0, area.width() - used)
                    hint = item.sizeHint()
                    policy = item.widget().sizePolicy() if item.widget() else None
                    height = h if policy is not None and policy.verticalPolicy() \
                        != QSizePolicy.Policy.Fixed else hint.height()
                    item.setGeometry(QRect(QPoint(x, y + (h - height) // 2),
                                           QSize(hint.width(), height)))
                    x += hint.width() + self.spacing()
            y += h + self.spacing()
        return y - self.spacing() - area.y() + m.top() + m.bottom() if y > area.y() else 0

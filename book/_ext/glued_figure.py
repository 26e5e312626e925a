"""``glued-figure``: a numbered figure, with a caption and alt text, of an image that a notebook
glued (myst-nb's ``glue:figure`` only reads the page's own notebook; the book's pages paste from
their chapter's notebook).

    ```{glued-figure} ch07-ablation-fig
    :doc: ../notebooks/ch07_ppo.ipynb
    :name: fig-ch07-ablation
    :alt: Three panels: returns, approximate KL and entropy of four runs.

    The caption, one paragraph.
    ```

The text refers to it with ``{numref}`fig-ch07-ablation```. The image itself arrives when myst-nb
resolves the glue reference, after the page is read; the alt text is set on it then.
"""

from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import directives
from myst_nb.ext.glue.utils import create_pending_glue_ref
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective

ALT = "glued_figure_alt"


class GluedFigure(SphinxDirective):
    required_arguments = 1  # the glue key
    has_content = True  # the caption
    option_spec = {
        "doc": directives.unchanged_required,
        "name": directives.unchanged_required,
        "alt": directives.unchanged_required,
    }

    def run(self) -> list[nodes.Node]:
        for option in ("doc", "name", "alt"):
            if option not in self.options:
                raise self.error(
                    f"glued-figure {self.arguments[0]}: the :{option}: option is missing"
                )
        if not self.content:
            raise self.error(f"glued-figure {self.arguments[0]}: the caption is missing")
        reference = create_pending_glue_ref(
            self.state.document,
            self.get_source_info()[0],
            self.lineno,
            self.options["doc"],
            self.arguments[0],
        )
        figure = nodes.figure("", reference)
        figure[ALT] = self.options["alt"]
        self.set_source_info(figure)
        self.add_name(figure)
        parsed = nodes.Element()
        self.state.nested_parse(self.content, self.content_offset, parsed)
        first = parsed[0]
        if not isinstance(first, nodes.paragraph):
            raise self.error(f"glued-figure {self.arguments[0]}: the caption must be a paragraph")
        caption = nodes.caption(first.rawsource, "", *first.children)
        caption.source, caption.line = first.source, first.line
        figure += caption
        if len(parsed) > 1:
            figure += nodes.legend("", *parsed[1:])
        return [figure]


class SetGluedFigureAlt(SphinxPostTransform):
    """The alt text on the image that replaced the glue reference (after myst-nb's, at 5)."""

    default_priority = 6

    def apply(self, **kwargs) -> None:
        for figure in self.document.findall(nodes.figure):
            if ALT in figure.attributes:
                for image in figure.findall(nodes.image):
                    image["alt"] = figure[ALT]


def setup(app):
    app.add_directive("glued-figure", GluedFigure)
    app.add_post_transform(SetGluedFigureAlt)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

(()=>{var D="./favicon-16x16-VSI62OPJ.png";})();
//# sourceMappingURL=favicon-16x16-V2DMIAZS.js.map
